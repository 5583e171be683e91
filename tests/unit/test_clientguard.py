"""The response head written with the app's spelling of header names (gate/http/clientguard.py)."""

from __future__ import annotations

from gate.http.clientguard import respell

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\naccess-control-allow-origin: *\r\nx-a: b: c\r\n\r\n"


def test_names_the_app_spelled_are_written_so_and_the_rest_as_it_was():
    out = respell(HEAD, {b"access-control-allow-origin": b"Access-Control-Allow-Origin", b"x-a": b"X-A"})
    assert out == b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nAccess-Control-Allow-Origin: *\r\nX-A: b: c\r\n\r\n"


def test_an_empty_spelling_or_a_status_line_that_looks_like_a_name_changes_nothing():
    assert respell(HEAD, {}) == HEAD
    assert respell(HEAD, {b"http/1.1 200 ok": b"X"}) == HEAD  # the status line is never a header
