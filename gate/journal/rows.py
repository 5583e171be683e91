"""Records <-> rows: what the writer inserts and what the read side hands back.

A record (``gate.records``) becomes a tuple in its table's column order for
``executemany`` (a sample's ``classes`` as compact JSON text); a row read back becomes
a dict keyed by the record field names, and ``decision_from_row`` /
``sample_from_row`` turn such dicts back into records.
"""

from __future__ import annotations

import json
import operator
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

from gate.data.records import AuditRecord, ClassSample, DecisionRecord, SampleRecord
from gate.journal.schema import AUDIT_FIELDS, COLUMNS, DECISION_FIELDS, SAMPLE_FIELDS

Row = DecisionRecord | AuditRecord | SampleRecord

_INSERT = {
    table: (f"INSERT INTO {table} (" + ", ".join(f'"{c}"' for c in cols) + ") VALUES (" + ", ".join("?" * len(cols)) + ")")
    for table, cols in COLUMNS.items()
}
_decision_tuple = operator.attrgetter(*DECISION_FIELDS)
_audit_tuple = operator.attrgetter(*AUDIT_FIELDS)
_sample_head = operator.attrgetter(*SAMPLE_FIELDS[:-1])
assert SAMPLE_FIELDS[-1] == "classes"


def _classes_json(classes: Iterable[ClassSample]) -> str:
    return json.dumps(
        [{"cls": c.cls, "in_flight": c.in_flight, "queued": c.queued} for c in classes],
        separators=(",", ":"),
    )


def _sample_tuple(row: SampleRecord) -> tuple[Any, ...]:
    return (*_sample_head(row), _classes_json(row.classes))


_TABLE_OF: dict[type, tuple[str, Callable[[Any], tuple[Any, ...]]]] = {
    DecisionRecord: ("decisions", _decision_tuple),
    AuditRecord: ("audit", _audit_tuple),
    SampleRecord: ("samples", _sample_tuple),
}

_TABLE_OF_NAME = {table: to_tuple for table, to_tuple in _TABLE_OF.values()}


def _decision_dict(row: sqlite3.Row) -> dict[str, Any]:
    d = dict(row)
    d["stream"] = bool(d["stream"])
    return d


def _sample_dict(row: sqlite3.Row) -> dict[str, Any]:
    d = dict(row)
    try:
        d["classes"] = json.loads(d["classes"]) if d["classes"] else []
    except ValueError:
        d["classes"] = []
    return d


def decision_from_row(row: dict[str, Any]) -> DecisionRecord:
    """A ``decisions_page`` dict back into a ``DecisionRecord``."""
    return DecisionRecord(**{f: row[f] for f in DECISION_FIELDS})


def sample_from_row(row: dict[str, Any]) -> SampleRecord:
    """A ``samples`` dict back into a ``SampleRecord``."""
    values = {f: row[f] for f in SAMPLE_FIELDS if f != "classes"}
    classes = tuple(ClassSample(c["cls"], c["in_flight"], c["queued"]) for c in row.get("classes") or ())
    return SampleRecord(**values, classes=classes)
