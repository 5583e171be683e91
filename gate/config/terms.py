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


#: a number TOML refuses for its leading zero (``05``, ``-007``, ``05.5``): read as a string by
#: `gate.config.edit.parse_value` (`--set`, `config set`), so the type error needs saying why
_LEADING_ZERO_RE = re.compile(r"([+-]?)0+(\d[\d_]*(?:\.\d+)?)")


def _got(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, str) and (m := _LEADING_ZERO_RE.fullmatch(value.strip())):
        # a trial's `--set classes.batch.queue_depth=05` read 'got string "05"': the 05 it typed
        # was a number to them
        return f"{_show(value)}, a number with a leading zero, which TOML does not allow: write {m.group(1)}{m.group(2)}"
    return f"{_type_name(value)} {_show(value)}"


def _key_part(name: str) -> str:
    return name if _BARE_KEY_RE.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {json.dumps(close[0])}?" if close else ""
