"""The read side: ``JournalQueries``, the SQL the live journal and the review share.

Read side
    A separate read-only connection (``mode=ro``) on its own thread, so reads never
    block the writer (WAL): ``decisions_page``, ``count_decisions``, ``audit_rows``,
    ``samples``. Rows come back as dicts keyed by the record field names (``cls``, not
    the column name ``class``) plus ``id``; ``stream`` is a bool and a sample's
    ``classes`` a list of ``{"cls", "in_flight", "queued"}`` dicts. The export
    (``tokengate log``) uses the column names instead, as operators read them.

``DecisionFilters`` is the one decision-filter type (its ``where()`` is the SQL); the
review screen builds its counts and exports on it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate.journal.rows import _decision_dict, _sample_dict
from gate.journal.schema import COLUMNS, select_list

#: the decision fields a filter may name, and their columns
_FIELD_FILTERS = {"cls": '"class"', "reason": "reason", "tenant": "tenant", "outcome": "outcome"}
FILTER_FIELDS = tuple(_FIELD_FILTERS)


def selects(present: Mapping[str, Collection[str]] | None = None) -> dict[str, str]:
    """Each table's SELECT (decisions with ``cls`` for ``"class"``) on a journal whose tables
    have the columns `present` (None: this schema's; schema.select_list)."""
    return {
        kind: f"SELECT {select_list(kind, None if present is None else present[kind], alias_class=kind == 'decisions')} FROM {kind}"
        for kind in COLUMNS
    }


@dataclass(frozen=True, slots=True)
class DecisionFilters:
    """The decision filters, one type for the queries, the export and the review screen: field
    filters (each None, one value, or a sequence of accepted values; ANDed) and the time range
    [since_ts, until_ts)."""

    cls: str | Sequence[str] | None = None
    reason: str | Sequence[str] | None = None
    tenant: str | Sequence[str] | None = None
    outcome: str | Sequence[str] | None = None
    since_ts: float | None = None
    until_ts: float | None = None

    def kwargs(self) -> dict[str, Any]:
        """The filters by name (what a caller that spells them out reads)."""
        return {name: getattr(self, name) for name in (*FILTER_FIELDS, "since_ts", "until_ts")}

    def where(self) -> tuple[list[str], list[Any]]:
        """SQL clauses (to AND) and their parameters."""
        clauses: list[str] = []
        params: list[Any] = []
        for name, column in _FIELD_FILTERS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str):
                clauses.append(f"{column} = ?")
                params.append(value)
                continue
            values = list(value)
            if not values:
                clauses.append("0")
                continue
            clauses.append(f"{column} IN ({', '.join('?' * len(values))})")
            params.extend(values)
        if self.since_ts is not None:
            clauses.append("ts >= ?")
            params.append(self.since_ts)
        if self.until_ts is not None:
            clauses.append("ts < ?")
            params.append(self.until_ts)
        return clauses, params


def time_where(since_ts: float | None, until_ts: float | None) -> tuple[list[str], list[Any]]:
    """A time range alone, for the audit rows and the samples."""
    return DecisionFilters(since_ts=since_ts, until_ts=until_ts).where()


class JournalQueries:
    """The read side, shared by the live journal and the read-only review: SQL only.

    A subclass provides ``_fetch(sql, params) -> rows`` on a connection of its own,
    so reads never wait behind the writer.
    """

    #: the SELECT of each table (a read-only reader of an older journal sets its own)
    _selects: dict[str, str] = selects()

    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        raise NotImplementedError

    async def decisions_page(
        self,
        *,
        after_id: int | None = None,
        before_id: int | None = None,
        limit: int = 200,
        filters: DecisionFilters | None = None,
        **fields: Any,
    ) -> list[dict[str, Any]]:
        """One page of decisions in time order (``ts``, then ``id``), keyset-paged: the
        id of a row already shown is the cursor.

        * neither ``after_id`` nor ``before_id``: the newest ``limit`` rows, newest first;
        * ``before_id=X``: the ``limit`` rows just older than row X, newest first
          (scrolling back: pass the last id of the previous page; [] once X is gone);
        * ``after_id=X``: the ``limit`` rows just newer than row X, OLDEST first
          (scrolling forward or tailing: pass the newest id seen; if row X was deleted
          by retention, everything left counts as newer);
        * both: rows strictly between the two, newest first, the ``limit`` nearest X.

        Ordering by (ts, id) rather than id alone lets the (class|outcome|tenant, ts)
        indexes serve a filtered page without sorting; ids follow ts except across a
        wall-clock step, and the (ts, id) keyset stays exact either way.

        ``filters``: a :class:`DecisionFilters` (``since_ts`` inclusive, ``until_ts`` exclusive),
        or its fields as keywords.
        """
        clauses, params = (filters or DecisionFilters(**fields)).where()
        if after_id is not None:
            clauses.append("(ts, id) > (COALESCE((SELECT ts FROM decisions WHERE id = ?), -1e308), ?)")
            params += [after_id, after_id]
        if before_id is not None:
            clauses.append("(ts, id) < ((SELECT ts FROM decisions WHERE id = ?), ?)")
            params += [before_id, before_id]
        ascending = after_id is not None and before_id is None
        sql = self._selects["decisions"]
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        direction = "ASC" if ascending else "DESC"
        sql += f" ORDER BY ts {direction}, id {direction} LIMIT ?"
        params.append(max(0, int(limit)))
        return [_decision_dict(r) for r in await self._fetch(sql, params)]

    async def count_decisions(self, filters: DecisionFilters | None = None, **fields: Any) -> int:
        clauses, params = (filters or DecisionFilters(**fields)).where()
        sql = "SELECT COUNT(*) FROM decisions"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        rows = await self._fetch(sql, params)
        return int(rows[0][0])

    async def audit_rows(
        self, since_ts: float | None = None, until_ts: float | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit rows in time order (oldest first); ``limit`` keeps the newest N."""
        clauses, params = time_where(since_ts, until_ts)
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        if limit is None:
            sql = self._selects["audit"] + where + " ORDER BY ts, id"
        else:
            sql = f"SELECT * FROM ({self._selects['audit']}{where} ORDER BY ts DESC, id DESC LIMIT ?) ORDER BY ts, id"
            params.append(max(0, int(limit)))
        return [dict(r) for r in await self._fetch(sql, params)]

    async def last_audit(self, action: str) -> dict[str, Any] | None:
        """The newest audit row of ``action``, or None."""
        rows = await self._fetch(self._selects["audit"] + " WHERE action = ? ORDER BY ts DESC, id DESC LIMIT 1", [action])
        return dict(rows[0]) if rows else None

    async def samples(
        self,
        since_ts: float | None = None,
        until_ts: float | None = None,
        backend: str | None = None,
        *,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Samples in time order (oldest first); ``limit`` keeps the newest N of them."""
        clauses, params = time_where(since_ts, until_ts)
        if backend is not None:
            clauses.append("backend = ?")
            params.append(backend)
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        if limit is None:
            sql = self._selects["samples"] + where + " ORDER BY ts, id"
        else:
            sql = f"SELECT * FROM ({self._selects['samples']}{where} ORDER BY ts DESC, id DESC LIMIT ?) ORDER BY ts, id"
            params.append(max(0, int(limit)))
        return [_sample_dict(r) for r in await self._fetch(sql, params)]
