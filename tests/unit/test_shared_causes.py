"""The causes of a degraded [shared] gate (gate/fleet/sharedlimits/causes.py) and rule 4's `cause`.

The real Redis cases (a wrong password, a refused connection, a paused Redis) are in
tests/integration/test_shared_causes.py; here what no real Redis says on demand."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ResponseError

from gate.fleet.sharedlimits.causes import scrub, slow
from gate.fleet.sharedlimits.client import cause_of
from gate.fleet.sharedlimits.health import SharedHealth

URL = "redis://alice:p%40ss-word@10.0.0.5:6379/3"


def test_a_message_that_quoted_the_password_is_scrubbed_as_written_and_decoded() -> None:
    said = scrub("AUTH alice p@ss-word failed; url had p%40ss-word", URL)
    assert "p@ss-word" not in said and "p%40ss-word" not in said and "alice" in said


def test_causes_an_operator_acts_on() -> None:
    assert cause_of(NoPermissionError("this user has no permissions to run the 'evalsha' command"), URL).kind == "auth"
    db = cause_of(ResponseError("DB index is out of range"), URL)
    assert (db.kind, db.text) == ("auth", "Redis has no database 3")
    closed = cause_of(RedisConnectionError("Connection closed by server."), URL)
    assert (closed.kind, closed.text) == ("unreachable", "Redis closed the connection")
    refused = cause_of(RedisConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused."), URL)
    assert (refused.kind, refused.text) == ("refused", "Redis refused the connection")
    assert cause_of(TimeoutError("no answer in 1000 ms"), URL, bound_ms=1000).text == "Redis did not answer within 1000 ms"
    assert cause_of(ResponseError("OOM command not allowed"), URL).text == "Redis answered with an error"


def test_the_cause_is_the_latest_trouble_while_degraded_and_gone_once_back() -> None:
    health = SharedHealth("fail_closed")
    assert health.cause == ""
    assert health.timed_out("100 ms", slow(100).text) is not None
    assert health.cause == "Redis did not answer within 100 ms"
    assert health.failed("refused (lease renewal: Error 111)", "Redis refused the connection") is None  # no flip: degraded already
    assert health.cause == "Redis refused the connection"
    assert health.probed(1, True) is not None and health.state == "ok" and health.cause == ""
