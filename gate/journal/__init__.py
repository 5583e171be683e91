"""The SQLite journal: decisions, audit and samples, written by one group-commit writer.

Never the prompt text: the records carry none.

A record flows records -> rows -> writer (one transaction per batch) -> SQLite <- queries,
one module each:

- ``schema``: the tables (DDL), their column names, ``MIGRATIONS`` / ``SCHEMA_VERSION``,
  ``migrate_sync`` for plain ``sqlite3`` connections, ``JournalError`` /
  ``JournalVersionError``. ``tokengate log`` (``gate.export``) needs only this.
- ``rows``: records <-> rows: the INSERT statements and record-to-tuple conversion of
  the write side, the row-to-dict conversion of the read side, ``decision_from_row`` /
  ``sample_from_row``.
- ``queries``: ``JournalQueries``, the read side's SQL, shared by the live journal and
  the review screen, and ``DecisionFilters``, the one decision-filter type (its SQL too).
- ``writer``: ``Journal``, the group-commit writer (``add``, faults and backoff,
  retention, the file's permissions, ``health``) and its read-only connection.

- ``reader``: the read side for people: ``JournalReader`` (review), ``DecisionFilters``
  (re-exported), the CSV export of a filtered view; ``export``: ``tokengate log``.

May know: `gate.core`, `gate.data` (the records it stores), `gate.config`, aiosqlite.

Import from ``gate.journal``; the submodules are its layout, not its interface.
"""

from __future__ import annotations

from gate.journal.queries import DecisionFilters, JournalQueries, time_where
from gate.journal.rows import Row, decision_from_row, sample_from_row
from gate.journal.schema import (
    AUDIT_FIELDS,
    COLUMNS,
    DECISION_FIELDS,
    MIGRATIONS,
    SAMPLE_FIELDS,
    SCHEMA_VERSION,
    TABLES,
    JournalError,
    JournalVersionError,
    migrate_sync,
)
from gate.journal.writer import Journal, JournalHealth, write_now

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "Journal",
    "JournalError",
    "JournalHealth",
    "JournalQueries",
    "JournalVersionError",
    "Row",
    "decision_from_row",
    "DecisionFilters",
    "time_where",
    "write_now",
    "migrate_sync",
    "sample_from_row",
    # The field and table tuples and the migrations: public names of the module before the split.
    "AUDIT_FIELDS",
    "DECISION_FIELDS",
    "MIGRATIONS",
    "SAMPLE_FIELDS",
    "TABLES",
]
