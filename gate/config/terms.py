"""The user's TOML terms, shared by the reader and the checks so that both speak alike: key
names (``class`` for ``class_name``), dotted key parts, values as written in TOML, type names
and did-you-mean hints.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Iterable
from typing import Any

_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key_of(f: dataclasses.Field[Any]) -> str:
    return "class" if f.name == "class_name" else f.name


def _show(value: Any) -> str:
    """A value as the user would have written it in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "a table"
    return str(value)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__  # dates and times


def _got(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    return f"{_type_name(value)} {_show(value)}"


def _key_part(name: str) -> str:
    return name if _BARE_KEY_RE.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {json.dumps(close[0])}?" if close else ""
