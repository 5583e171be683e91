"""Pure: arguments and prompts: the --ctx/--concurrency lists, the server URL, and the
plain-word prompt text (the same words rotated, so no two prompts share a prefix)."""

from __future__ import annotations

import random
import urllib.parse
from collections.abc import Sequence


def parse_int_list(text: str, *, what: str = "value") -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4). Raises ValueError naming the bad item."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"no {what} given")
    out = []
    for item in items:
        try:
            n = int(item)
        except ValueError:
            raise ValueError(f"not an integer {what}: {item!r}") from None
        if n < 1:
            raise ValueError(f"{what} must be >= 1: {n}")
        out.append(n)
    return tuple(sorted(set(out)))


def parse_ctx_list(text: str) -> tuple[int, ...]:
    """``"512,1k,2K,4096"`` -> (512, 1024, 2048, 4096)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError("no context length given")
    out = []
    for item in items:
        mult = 1
        body = item
        if body[-1:] in ("k", "K"):
            mult, body = 1024, body[:-1]
        try:
            n = round(float(body) * mult) if mult != 1 else int(body)
        except ValueError:
            raise ValueError(f"not a context length: {item!r} (use e.g. 512,1k,2048)") from None
        if n < 4:
            raise ValueError(f"context length must be >= 4 tokens: {item!r}")
        out.append(n)
    return tuple(sorted(set(out)))


def normalize_url(url: str) -> str:
    """``http(s)://host[:port]`` with no path (a trailing slash is dropped); ValueError otherwise."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"give the server's base URL without a path: {url!r}")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError:
        raise ValueError(f"bad port in {url!r}") from None
    return f"{parts.scheme}://{parts.netloc}"


_WORDS = (
    "the quick brown fox jumps over lazy dog while river stone market table window garden "
    "morning evening paper light water mountain forest village road bridge city tower field "
    "green blue red yellow small large old young warm cold bright dark simple clear quiet loud "
    "story letter music picture number question answer reason moment season country history "
    "friend family teacher student doctor farmer worker driver painter writer reader singer "
    "walk run read write speak listen think build carry bring find keep hold open close start "
    "finish follow learn teach watch travel plant grow wait change return visit help move turn "
    "apple bread cheese coffee sugar salt honey lemon orange potato tomato onion pepper rice "
    "chair door floor wall roof lamp clock cup plate spoon knife glass bottle basket box bag "
    "cloud rain snow wind storm sun moon star sky sea lake hill valley island desert shore"
).split()


def word_sequence(n: int, seed: int = 0) -> list[str]:
    """``n`` plain words, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.choice(_WORDS) for _ in range(n)]


def rotated_text(words: Sequence[str], k: int) -> str:
    """The words rotated by ``k``: the same tokens in another order, so no two prompts share a prefix."""
    if not words:
        return ""
    k %= len(words)
    return " ".join([*words[k:], *words[:k]])
