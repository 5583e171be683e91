"""The fake tokenizer, the chat template and the pseudo-word vocabulary.

Fake tokenizer: ``ceil(utf-8 bytes / 4)`` tokens, +1 BOS when ``add_special``.
"""

from __future__ import annotations

import math
import random
import zlib
from typing import Any

VOCAB_SIZE = 32000
BOS_ID, EOS_ID = 1, 2


def count_tokens(text: str, add_special: bool = False) -> int:
    """Tokens :func:`fake_tokenize` gives: one per 4 bytes of UTF-8 (rounded up), +1 BOS."""
    return math.ceil(len(text.encode("utf-8")) / 4) + (1 if add_special else 0)


def fake_tokenize(text: str, add_special: bool = False) -> list[tuple[int, str]]:
    """Deterministic fake tokens as (id, piece): BOS when `add_special`, then one per 4 bytes."""
    data = text.encode("utf-8")
    out = [(BOS_ID, "<s>")] if add_special else []
    for i in range(0, len(data), 4):
        chunk = data[i : i + 4]
        out.append((259 + zlib.crc32(chunk) % (VOCAB_SIZE - 259), chunk.decode("utf-8", errors="replace")))
    return out


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if content is None else str(content)


def apply_template(messages: list[Any], add_generation_prompt: bool = True) -> str:
    """A ChatML rendering of `messages` (llama-server applies the model's template)."""
    parts = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError("each message needs a string 'role'")
        parts.append(f"<|im_start|>{m['role']}\n{_message_text(m.get('content'))}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _make_vocab(seed: int, n: int = 512) -> list[str]:
    rng = random.Random(f"vocab:{seed}")
    onsets, vowels, codas = "bcdfghklmnprstvz", "aeiou", ["", "", "n", "r", "s", "l", "th", "m"]
    words: set[str] = set()
    while len(words) < n:
        syllables = rng.choice((1, 1, 2, 2, 2, 3))
        words.add("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(syllables)))
    return sorted(words)
