"""Edit keys of a tokengate TOML file in place, keeping everything else (comments, order).

`tokengate config set FILE budget.min_tokens=1024 classes.batch.reserved_tokens=0` and
`tokengate overrides write` use it; so can a calibration's recommendation. A dotted key
names its table and key (`budget.min_tokens` -> `[budget]` `min_tokens`); a key already
in its table has its line replaced (the comment after it kept), a new one goes after the
table's last key line, a table not in the file is appended. The result is parsed and
validated before it is written (`config_check`), so a bad edit changes nothing.

Only plain `[table]` headers are edited: a table written inline or as dotted keys under
another header is refused with the key's name (edit that by hand). A list of tables
(`[[backends]]`, `[[tenants]]`, `[[fleet]]`) is named by its place: `backends[0].url` is the
first `[[backends]]` table's `url`; `backends.url` is refused with that hint (ValueError).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

_HEADER = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise ValueError(f"cannot write {value!r} as a TOML value")


def parse_value(text: str) -> Any:
    """`1024` -> 1024, `0.5` -> 0.5, `true` -> True, `"x"` or `x` -> "x"."""
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def split_key(dotted: str) -> tuple[str, str]:
    table, _, key = dotted.rpartition(".")
    if not table or not key:
        raise ValueError(f"{dotted!r}: give TABLE.KEY, e.g. budget.min_tokens or classes.batch.reserved_tokens")
    return table, key


def set_keys(text: str, edits: Iterable[tuple[str, Any]]) -> str:
    """`text` with each dotted key set to its value."""
    lines = text.splitlines()
    for dotted, value in edits:
        table, key = split_key(dotted)
        lines = _set(lines, table, key, toml_value(value))
    return "\n".join(lines) + "\n"


_ARRAY = re.compile(r"^\s*\[\[([^\[\]]+)\]\]\s*(#.*)?$")
_INDEXED = re.compile(r"^(\w+)\[(\d+)\]$")
#: the config's lists of tables: a key in one is named by the table's place, backends[0].url
LIST_TABLES = ("backends", "tenants", "fleet")


def _set(lines: list[str], table: str, key: str, value: str) -> list[str]:
    indexed = _INDEXED.match(table)
    if indexed:  # backends[0]: the first [[backends]] table
        name, want = indexed.group(1), int(indexed.group(2))
        found = [i for i, line in enumerate(lines) if (m := _ARRAY.match(line)) and m.group(1).strip() == name]
        if want >= len(found):
            raise ValueError(f"{table}.{key}: the file has {len(found)} [[{name}]] table(s), counted from 0 (add a new one by hand)")
        start: int | None = found[want]
    elif table in LIST_TABLES or any((m := _ARRAY.match(line)) and m.group(1).strip() == table for line in lines):
        raise ValueError(f"{table}.{key}: [[{table}]] is a list of tables: name one by its place, {table}[0].{key} for the first")
    else:
        start = next((i for i, line in enumerate(lines) if (m := _HEADER.match(line)) and m.group(1).strip() == table), None)
    if start is None:
        return [*lines, "", f"[{table}]", f"{key} = {value}"]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    key_re = re.compile(rf"^(\s*){re.escape(key)}\s*=\s*(.*)$")
    last = start
    for i in range(start + 1, end):
        m = key_re.match(lines[i])
        if m:
            comment = ""
            rest = m.group(2)
            if "#" in rest and not rest.strip().startswith(('"', "'", "[")):
                comment = "  " + rest[rest.index("#") :]
            return [*lines[:i], f"{m.group(1)}{key} = {value}{comment}", *lines[i + 1 :]]
        if lines[i].strip() and not lines[i].lstrip().startswith("#"):
            last = i
    return [*lines[: last + 1], f"{key} = {value}", *lines[last + 1 :]]
