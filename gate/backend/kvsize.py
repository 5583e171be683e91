"""KV cache bytes per token, from the model's GGUF header (when the file is local).

llama.cpp sizes its KV cache as, per token::

    sum over layers of  row_size(type_k, n_embd_k_gqa) + row_size(type_v, n_embd_v_gqa)
    n_embd_k_gqa = head_dim_k * n_head_kv      head_dim_k = key_length   (default n_embd / n_head)
    n_embd_v_gqa = head_dim_v * n_head_kv      head_dim_v = value_length (default n_embd / n_head)

with the default cache type f16 (2 bytes an element).  Total KV bytes =
bytes per token x n_ctx.  The hyper-parameters are only in the GGUF header, not
over HTTP, so this reads ``/props``' ``model_path`` on the same host.

Keys read (``{arch}`` = ``general.architecture``): ``{arch}.block_count``,
``{arch}.embedding_length``, ``{arch}.attention.head_count``,
``{arch}.attention.head_count_kv`` (default: head_count; a per-layer array is
summed layer by layer), optional ``{arch}.attention.key_length`` /
``value_length``.  Models with another cache layout (MLA, sliding-window or
recurrent layers) get the plain formula's figure: an upper-bound estimate.

The ``gguf`` package is a test extra: imported lazily; without it, or with an
unreadable / remote / malformed file, the answer is None with a reason.
Nothing here raises.  Parsing is BLOCKING (the header of a large model with a
big vocabulary takes a fraction of a second): run it in a thread.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gate.backend.pool import Backend

__all__ = ["CACHE_TYPES", "KvSize", "kv_bytes_per_token", "kv_size"]

# ggml type -> (bytes per block, elements per block), for --cache-type-k / -v.
CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f32": (4, 1),
    "f16": (2, 1),
    "bf16": (2, 1),
    "q8_0": (34, 32),
    "q4_0": (18, 32),
    "q4_1": (20, 32),
    "iq4_nl": (18, 32),
    "q5_0": (22, 32),
    "q5_1": (24, 32),
}


@dataclass(frozen=True, slots=True)
class KvSize:
    bytes_per_token: int | None  # None: see reason
    reason: str | None = None
    arch: str | None = None
    n_layer: int | None = None
    n_head: int | None = None
    n_head_kv: tuple[int, ...] | None = None  # per layer
    head_dim_k: int | None = None
    head_dim_v: int | None = None


def _row_size(cache_type: str, n: int) -> int:
    size, block = CACHE_TYPES[cache_type]
    return n * size // block


def _field(reader: Any, key: str) -> Any:
    """A field's value (scalar, str, or list for arrays); None when absent."""
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def kv_size(path: str | os.PathLike, *, cache_type_k: str = "f16", cache_type_v: str = "f16") -> KvSize:
    """KV bytes per token for the GGUF at ``path``, with the geometry it came from."""
    for ct in (cache_type_k, cache_type_v):
        if ct not in CACHE_TYPES:
            return KvSize(None, f"unknown cache type {ct!r}")
    text = os.fspath(path)
    if "://" in text:
        return KvSize(None, f"not a local file: {text}")
    if not os.path.isfile(text):
        return KvSize(None, f"no such file: {text}")
    if not os.access(text, os.R_OK):
        return KvSize(None, f"not readable: {text}")
    try:
        from gguf import GGUFReader
    except ImportError:
        return KvSize(None, "gguf package not installed")
    try:
        reader = GGUFReader(text)
    except Exception as err:
        return KvSize(None, f"not a readable GGUF file: {type(err).__name__}: {err}")
    try:
        return _from_reader(reader, cache_type_k, cache_type_v)
    except Exception as err:  # a malformed header: odd types, zero heads...
        return KvSize(None, f"bad GGUF header: {type(err).__name__}: {err}")
    finally:
        del reader  # drop the memory map


def _from_reader(reader: Any, cache_type_k: str, cache_type_v: str) -> KvSize:
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        return KvSize(None, "GGUF header has no general.architecture")
    missing = [k for k in ("block_count", "embedding_length", "attention.head_count") if _field(reader, f"{arch}.{k}") is None]
    if missing:
        return KvSize(None, "GGUF header lacks " + ", ".join(f"{arch}.{k}" for k in missing), arch=arch)
    n_layer = int(_field(reader, f"{arch}.block_count"))
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_head = _field(reader, f"{arch}.attention.head_count")
    if isinstance(n_head, list):  # per-layer head counts (some archs): use the first non-zero
        n_head = next((int(h) for h in n_head if h), 0)
    n_head = int(n_head)
    kv = _field(reader, f"{arch}.attention.head_count_kv")
    if kv is None:
        kv = n_head
    per_layer = tuple(int(h) for h in kv) if isinstance(kv, list) else (int(kv),) * n_layer
    if len(per_layer) != n_layer:
        return KvSize(None, f"{arch}.attention.head_count_kv has {len(per_layer)} entries for {n_layer} layers", arch=arch)
    key_length = _field(reader, f"{arch}.attention.key_length")
    value_length = _field(reader, f"{arch}.attention.value_length")
    if (key_length is None or value_length is None) and n_head <= 0:
        return KvSize(None, f"{arch}.attention.head_count is {n_head}", arch=arch)
    head_dim_k = int(key_length) if key_length is not None else n_embd // n_head
    head_dim_v = int(value_length) if value_length is not None else n_embd // n_head
    total = sum(_row_size(cache_type_k, head_dim_k * h) + _row_size(cache_type_v, head_dim_v * h) for h in per_layer)
    return KvSize(
        bytes_per_token=total,
        arch=arch,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=per_layer,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
    )


def kv_bytes_per_token(path: str | os.PathLike, *, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int | None:
    """KV cache bytes per token (f16 cache by default), or None (see :func:`kv_size` for why)."""
    return kv_size(path, cache_type_k=cache_type_k, cache_type_v=cache_type_v).bytes_per_token


async def learn_kv_sizes(backends: Iterable[Backend]) -> None:
    """Each local backend's KV bytes per token, from its GGUF header, once (file I/O: a thread)."""
    for b in backends:
        if b.kv_bytes_per_token is None and b.props.get("model_path"):
            b.kv_bytes_per_token = await asyncio.to_thread(kv_bytes_per_token, b.props["model_path"]) or 0
