"""Request bodies: bytes -> a JSON object the gate can forward faithfully, or a 400.

Pure. Python's json module accepts more than llama-server (nlohmann::json) can
take back; everything below is refused with 400 ``invalid_request`` naming where
the problem is, so it never becomes a 5xx further down the path:

* not UTF-8 (a leading BOM is ignored), empty, or not a JSON object;
* ``NaN``/``Infinity`` literals, and numbers that overflow a double (``1e309``
  parses to ``inf`` and would be forwarded as ``Infinity``, which is not JSON);
* integers outside int64/uint64 (llama-server reads them as doubles, or fails);
  both kinds of number are reported with the path of the field that holds them;
* duplicate keys (which one wins differs between parsers);
* nesting deeper than :data:`MAX_JSON_DEPTH`;
* lone UTF-16 surrogates (``"\\ud800"``): valid JSON text, but no UTF-8 encoding
  exists, so neither the token counter nor the upstream request could send them.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from gate.core.errors import GateError
from gate.core.reasons import Reason

# Deepest JSON nesting accepted. Real requests (tool schemas included) stay far below; the
# limit keeps every later json.dumps / walk of the body well inside Python's recursion limit.
MAX_JSON_DEPTH = 64

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
# A lone surrogate can only come from a \u escape: raw UTF-8 cannot encode one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class _JsonRuleError(ValueError):
    """Valid for Python's json module, but not JSON we accept."""


def invalid(message: str, param: str | None = None) -> GateError:
    return GateError(Reason.INVALID_REQUEST, message, param)


def decode_body(raw: bytes) -> dict[str, Any]:
    """Bytes -> a JSON object, or 400 ``invalid_request`` saying what is wrong and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"request body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise invalid("request body is empty; expected a JSON object")
    overflow: list[str] = []
    try:
        body = json.loads(
            text,
            object_pairs_hook=_object_no_duplicates,
            parse_constant=_no_constant,
            parse_float=lambda s: _float(s, overflow),
            parse_int=lambda s: _int(s, overflow),
        )
    except _JsonRuleError as e:
        raise invalid(f"invalid JSON: {e}") from None
    except json.JSONDecodeError as e:
        raise invalid(f"invalid JSON: {e.msg} at line {e.lineno}, column {e.colno} (char {e.pos})") from None
    except RecursionError:
        raise invalid(f"invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:  # an integer literal with more digits than int() converts
        raise invalid(f"invalid JSON: a number has more than {sys.get_int_max_str_digits()} digits") from None
    if not isinstance(body, dict):
        raise invalid(f"request body must be a JSON object, got {describe(body)}")
    # Brackets inside strings count too, so this bound is safe; walk only when it may bite.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(body, MAX_JSON_DEPTH):
        raise invalid(f"invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    if overflow:
        path = _find(body, _out_of_range)
        shown = overflow[0] if len(overflow[0]) <= 24 else overflow[0][:24] + "..."
        raise invalid(f"'{path}' is {shown}: out of range (a finite double, or an integer from -2^63 to 2^64-1)", path)
    if _SURROGATE_ESCAPE.search(raw):
        path = _find(body, lambda v: isinstance(v, str) and _SURROGATE.search(v) is not None, keys=True)
        if path is not None:
            raise invalid(f"'{path}' holds a lone UTF-16 surrogate (\\ud800-\\udfff): not encodable as UTF-8", path)
    return body


def _object_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _JsonRuleError(f"duplicate key {short(key)} in an object (ambiguous: send it once)")
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise _JsonRuleError(f"{name} is not a JSON value")


def _float(text: str, overflow: list[str]) -> float:
    value = float(text)
    if not math.isfinite(value) and not overflow:
        overflow.append(text)  # reported with its path once the whole body is parsed
    return value


def _int(text: str, overflow: list[str]) -> int:
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX and not overflow:
        overflow.append(text)
    return value


def _out_of_range(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _INT_MAX


def _too_deep(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
    return False


def _find(value: Any, bad, *, keys: bool = False, path: str = "") -> str | None:
    """The path (``messages[0].content``) of the first value (or key) for which `bad` is true."""
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if keys and bad(k):
                return here.encode("utf-8", "backslashreplace").decode()
            found = _find(v, bad, keys=keys, path=here)
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _find(v, bad, keys=keys, path=f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if bad(value):
        return (path or "body").encode("utf-8", "backslashreplace").decode()
    return None


def short(value: str, limit: int = 40) -> str:
    if len(value) > limit:
        value = value[:limit] + "..."
    return json.dumps(value)


def describe(value: Any) -> str:
    """How a JSON value is described in messages: its JSON type, and short values themselves."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        shown = str(value) if len(str(value)) <= 20 else str(value)[:20] + "..."
        return f"integer {shown}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {short(value)}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
