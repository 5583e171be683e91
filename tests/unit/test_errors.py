"""One error type, one renderer: status, OpenAI-shaped body, Retry-After rounded one way."""

from __future__ import annotations

import json

import pytest

from gate.backend.gatekeeper import Refused
from gate.core.errors import GateError, render
from gate.core.reasons import Reason


def test_render_shapes_the_body_and_rounds_retry_after_up():
    status, headers, body = render(GateError(Reason.QUEUE_FULL, "queue is full", retry_after_s=1.2))
    assert status == 429
    # spelled as llama-server spells its headers (Content-Type), not uvicorn's lower case (a trial)
    assert dict(headers) == {b"Content-Type": b"application/json", b"Retry-After": b"2", b"Retry-After-Ms": b"1200"}  # ceil: never early
    assert json.loads(body) == {
        "error": {"message": "queue is full", "type": "rate_limit_error", "code": "queue_full", "param": None},
        "retry_after_s": 1.2,
    }


@pytest.mark.parametrize("reason", [Reason.BODY_TOO_LARGE, Reason.CLIENT_STALLED])
def test_unread_body_answers_close_the_connection(reason):
    _, headers, _ = render(GateError(reason, "x"))
    assert (b"Connection", b"close") in headers


def test_a_backend_error_body_is_relayed_with_its_status():
    err = GateError(Reason.UPSTREAM_ERROR, "backend answered 400", status=400, body=b'{"error": {"code": 400}}')
    assert render(err)[0] == 400 and render(err)[2] == b'{"error": {"code": 400}}'
    assert err.outcome == "refused"  # the backend refused it: nothing failed
    assert GateError(Reason.UPSTREAM_ERROR, "broke").outcome == "failed"


@pytest.mark.parametrize(("status", "outcome"), [(501, "refused"), (500, "failed"), (502, "failed"), (503, "failed"), (504, "failed")])
def test_a_backends_501_is_a_refusal_its_other_5xx_failures(status, outcome):
    """llama-server's 501 (not_supported_error: /v1/embeddings without --embeddings, /infill
    without a FIM model) says the backend cannot do that at all: nothing failed, and journaled
    `failed` it paged the on-call (TokengateUpstream5xx) for a client's wrong route (a trial)."""
    err = GateError(Reason.UPSTREAM_ERROR, f"backend answered {status}", status=status, body=b"{}")
    assert err.outcome == outcome


@pytest.mark.parametrize(
    ("reason", "outcome"),
    [
        (Reason.SHED_OVERRUN, "shed"),
        (Reason.CLIENT_STALLED, "cancelled"),
        (Reason.UPSTREAM_TIMEOUT, "failed"),
        (Reason.INTERNAL_ERROR, "failed"),
        (Reason.NO_BACKEND, "refused"),
        (Reason.INVALID_REQUEST, "refused"),
    ],
)
def test_reason_knows_its_outcome(reason, outcome):
    assert reason.outcome == outcome


def test_the_core_refusal_is_a_gate_error():
    from gate.core.admission import Refuse
    from gate.core.ledger import Request

    refusal = Refuse(Request("r", "batch", "t", 10, 10, 0.0), Reason.TOKEN_BUDGET_EXCEEDED, "too big", 3.0)
    err = Refused(refusal)
    assert isinstance(err, GateError)
    assert (err.status, err.message, err.retry_after_s) == (429, "too big", 3.0)


def test_a_relayed_backend_answer_keeps_its_headers_and_the_gates_own_errors_add_none() -> None:
    relayed = GateError(Reason.UPSTREAM_ERROR, "backend answered 400", status=400, body=b'{"error":{}}')
    relayed.headers = [(b"access-control-allow-origin", b"http://a")]
    status, headers, body = render(relayed)
    assert (status, body) == (400, b'{"error":{}}') and (b"access-control-allow-origin", b"http://a") in headers
    own = GateError(Reason.QUEUE_FULL, "full")
    own.headers = [(b"x-ignored", b"1")]  # only a backend's own body brings its headers
    assert (b"x-ignored", b"1") not in render(own)[1]


def test_a_relayed_answer_has_one_content_type_its_own_wherever_it_comes() -> None:
    """llama-server's Content-Type (as it spelled it) replaces the gate's, in whatever place it
    came; the gate's Retry-After stays beside it."""
    relayed = GateError(Reason.UPSTREAM_ERROR, "backend answered 503", status=503, body=b"{}", retry_after_s=2.0)
    relayed.headers = [(b"x-a", b"1"), (b"Content-Type", b"application/json; charset=utf-8")]
    _, headers, _ = render(relayed)
    assert [v for k, v in headers if k.lower() == b"content-type"] == [b"application/json; charset=utf-8"]
    assert (b"Retry-After", b"2") in headers and (b"x-a", b"1") in headers
    relayed.headers = [(b"x-a", b"1")]  # none of its own: the gate's
    assert [v for k, v in render(relayed)[1] if k.lower() == b"content-type"] == [b"application/json"]


def test_retry_after_s_in_the_body_is_rounded_to_the_millisecond():
    """A fail_closed gate's body said "retry_after_s": 0.0030000000000001 (a fleet trial)."""
    _, headers, body = render(GateError(Reason.SHARED_LIMIT_UNAVAILABLE, "x", retry_after_s=0.0030000000000001))
    assert json.loads(body)["retry_after_s"] == 0.003
    assert dict(headers)[b"Retry-After"] == b"1"


def test_a_fault_in_the_gate_is_its_own_500_not_the_backend_s():
    status, _, body = render(GateError(Reason.INTERNAL_ERROR, "internal error in the gate"))
    assert status == 500 and json.loads(body)["error"]["code"] == "internal_error"
