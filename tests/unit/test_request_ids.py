from __future__ import annotations

import re

from gate.proxy import RequestIds


def test_request_ids_are_unique_32_hex_digits_and_differ_between_processes():
    ids = RequestIds()
    many = [ids() for _ in range(10_000)]
    assert len(set(many)) == len(many)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in many)
    other = RequestIds()  # another process (or gate) starts from another random prefix
    assert other()[:16] != many[0][:16]
