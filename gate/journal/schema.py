"""The journal's schema: the tables, their columns, the migrations and the errors.

Schema
    ``PRAGMA user_version`` is the schema version; ``MIGRATIONS[i]`` takes a journal from
    version ``i`` to ``i + 1`` (v1 creates everything). A journal written by a newer
    tokengate (a higher version than ``SCHEMA_VERSION``) is refused with
    ``JournalVersionError``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import Collection

from gate.data.records import AuditRecord, DecisionRecord, SampleRecord


def _column(field: str) -> str:
    return "class" if field == "cls" else field


DECISION_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DecisionRecord))
AUDIT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AuditRecord))
SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SampleRecord))

#: Column names per table, in record field order (``id`` first is not included).
COLUMNS: dict[str, tuple[str, ...]] = {
    "decisions": tuple(_column(f) for f in DECISION_FIELDS),
    "audit": tuple(_column(f) for f in AUDIT_FIELDS),
    "samples": tuple(_column(f) for f in SAMPLE_FIELDS),
}
TABLES: tuple[str, ...] = ("decisions", "audit", "samples")
_RECORDS = {"decisions": DecisionRecord, "audit": AuditRecord, "samples": SampleRecord}


def _literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def select_list(kind: str, present: Collection[str] | None = None, *, alias_class: bool = False) -> str:
    """The SELECT list of `kind`'s columns (``id`` first) on a journal whose table has the
    columns `present` (None: all): a reader never migrates, so a journal of an older schema
    (one an older gate still writes) reads a column added since as its record's default
    instead of failing with "no such column". `alias_class`: ``"class" AS cls``."""
    defaults = {_column(f.name): f.default for f in dataclasses.fields(_RECORDS[kind])}
    out = ["id"]
    for c in COLUMNS[kind]:
        name = "cls" if alias_class and c == "class" else c
        if present is None or c in present:
            out.append(f'"{c}" AS {name}' if name != c else f'"{c}"')
        else:
            default = defaults[c]
            out.append(f"{_literal(None if default is dataclasses.MISSING else default)} AS {name}")
    return ", ".join(out)


def present_columns(conn: sqlite3.Connection, kind: str) -> set[str]:
    """The columns `kind` has in this journal (PRAGMA table_info)."""
    return {row[1] for row in conn.execute(f"PRAGMA table_info({kind})")}


_V1 = (
    """CREATE TABLE decisions (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        request_id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        "class" TEXT NOT NULL,
        backend TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        stream INTEGER NOT NULL,
        prompt_tokens INTEGER,
        token_count_source TEXT,
        max_tokens INTEGER,
        reserved_tokens INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        reason TEXT NOT NULL,
        http_status INTEGER NOT NULL,
        queue_ms REAL,
        ttft_ms REAL,
        duration_ms REAL NOT NULL,
        completion_tokens INTEGER,
        budget_at_decision INTEGER,
        in_flight_at_decision INTEGER
    )""",
    "CREATE INDEX decisions_ts ON decisions (ts)",
    'CREATE INDEX decisions_class_ts ON decisions ("class", ts)',
    "CREATE INDEX decisions_outcome_ts ON decisions (outcome, ts)",
    "CREATE INDEX decisions_tenant_ts ON decisions (tenant, ts)",
    """CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        operator TEXT NOT NULL,
        origin TEXT NOT NULL,
        source TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        old_value TEXT,
        new_value TEXT,
        note TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX audit_ts ON audit (ts)",
    """CREATE TABLE samples (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        backend TEXT NOT NULL,
        budget INTEGER,
        in_flight INTEGER NOT NULL,
        queued INTEGER NOT NULL,
        slots_busy INTEGER,
        slots_total INTEGER,
        gpu_used_bytes INTEGER,
        gpu_total_bytes INTEGER,
        p95_ttft_ms REAL,
        p95_tpot_ms REAL,
        admitted INTEGER NOT NULL,
        refused INTEGER NOT NULL,
        classes TEXT NOT NULL DEFAULT '[]'
    )""",
    "CREATE INDEX samples_ts ON samples (ts)",
)

# v2: which gate wrote an audit or sample row (host:pid:start), so merged journals stay apart.
_V2 = (
    "ALTER TABLE audit ADD COLUMN gate_id TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE samples ADD COLUMN gate_id TEXT NOT NULL DEFAULT ''",
)

# v3: router mode: which model answered a request, and the one it asked for when a fallback did.
_V3 = (
    "ALTER TABLE decisions ADD COLUMN model TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE decisions ADD COLUMN rerouted_from TEXT NOT NULL DEFAULT ''",
)

# v4: what `tokengate replay` needs. The first token measured from arrival (the client's TTFT;
# `ttft_ms` stays measured from dispatch, as the controller sees it), and per sample the rows
# the writer had dropped so far (a rise marks a window whose decisions are incomplete). Rows
# written before v4 hold NULL / 0 there: replay refuses a window of them, and says so.
_V4 = (
    "ALTER TABLE decisions ADD COLUMN ttft_arrival_ms REAL",
    "ALTER TABLE samples ADD COLUMN journal_dropped INTEGER NOT NULL DEFAULT 0",
)

# v5: why the gate refused or ended a request, as its client was told (one reason code covers
# a refusal at arrival for the TTFT objective, one while waiting, and queue_timeout_s itself).
_V5 = ("ALTER TABLE decisions ADD COLUMN detail TEXT NOT NULL DEFAULT ''",)

#: ``MIGRATIONS[i]`` takes a journal from schema version ``i`` to ``i + 1``. Append only.
MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2, _V3, _V4, _V5)
SCHEMA_VERSION = len(MIGRATIONS)


class JournalError(Exception):
    """The journal cannot be used as asked (the message names the file)."""


class JournalVersionError(JournalError):
    """The journal was written by a newer tokengate than this one."""


def _newer_message(path: str, version: int) -> str:
    return (
        f"{path}: journal schema version {version} is newer than this tokengate understands "
        f"(up to {SCHEMA_VERSION}); upgrade tokengate or point it at another journal file"
    )


def migrate_sync(conn: sqlite3.Connection, path: str = "<journal>") -> int:
    """Bring a plain ``sqlite3`` connection's schema up to date (benchmarks, tools).

    The connection must be in autocommit mode (``isolation_level=None``). Returns the
    version found before migrating.
    """
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version > SCHEMA_VERSION:
        raise JournalVersionError(_newer_message(path, version))
    if version < SCHEMA_VERSION:
        conn.execute("BEGIN IMMEDIATE")
        try:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            for step in MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
    return version
