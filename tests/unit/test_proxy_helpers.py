from __future__ import annotations

import re

from gate.http.requestids import HeaderNames, RequestIds


def test_request_ids_are_unique_32_hex_digits_and_differ_between_processes():
    ids = RequestIds()
    many = [ids() for _ in range(10_000)]
    assert len(set(many)) == len(many)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in many)
    other = RequestIds()  # another process (or gate) starts from another random prefix
    assert other()[:16] != many[0][:16]


def test_header_names_are_shared_lowercase_and_the_table_is_bounded():
    names = HeaderNames(limit=2)
    first = names(b"Content-Type")
    assert first == "content-type" and names(b"Content-Type") is first  # one str for every request
    names(b"x-a")
    flood = [names(f"x-{i}".encode()) for i in range(100)]  # names a client made up
    assert flood[5] == "x-5" and len(names._known) == 2
