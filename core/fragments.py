"""Typed SQL fragments: a table owner's write (or read) as SQL plus the parameters it binds, and the statements
composed of them.

A table has one owner module (docs/ARCHITECTURE.md, "One owner per table"). Where a transaction must stay one
round trip, the owner publishes a ``Fragment`` instead of a statement, and another module splices it into its
own statement with ``compose``. The parameters are data, not a docstring, and two checks keep them honest:

* at import time, ``Fragment`` and ``compose`` read the bind parameters of the SQL (SQLAlchemy's own parse of
  ``:name``) and fail with ``ParamsMismatch`` unless they are exactly the declared ones: the fragment's, and for
  a statement, the union of its fragments' and its own (the parameters of its own SQL and of the conditions it
  hands its fragments);
* at execution, ``Statement.execute`` fails with ``ParamsMismatch`` before anything is sent unless the
  parameters given are exactly those the statement requires, naming the missing and the unexpected ones.

Every composed statement is registered in ``COMPOSED`` by its name, so one test can execute each of them against
PostgreSQL (``tests/taskstate/test_fragments.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, CursorResult, TextClause, text

from core import db

_SLOT = re.compile(r"\{(\w+)\}")


class ParamsMismatch(TypeError):
    """Declared parameters and SQL, or given parameters and a statement, disagree: a programming error."""


def binds_of(sql: str) -> frozenset[str]:
    """The bind parameters of ``sql``, as SQLAlchemy's ``text`` reads them (``:name``, not ``::type``)."""
    return frozenset(text(sql)._bindparams)


def _mismatch(what: str, declared: Iterable[str], found: Iterable[str], *, given: bool = False) -> str | None:
    """None when ``found`` (the SQL's binds, or the parameters ``given``) is exactly ``declared``; else what
    differs, by name."""
    declared, found = set(declared), set(found)
    if declared == found:
        return None
    missing, extra = sorted(declared - found), sorted(found - declared)
    if given:
        return f"{what} requires exactly {sorted(declared)}: the parameters given miss {missing} and add {extra}"
    return f"{what}: its SQL binds {extra} that are not declared, and does not bind {missing} that are"


@dataclass(frozen=True)
class Cte:
    """A fragment placed in a statement: its SQL as ``name AS (...)``, and the parameters it binds."""

    sql: str
    params: frozenset[str]
    owner: str


@dataclass(frozen=True)
class Fragment:
    """One owner's SQL, spliced into others' statements. ``template`` may hold ``{when}``, the condition under
    which a write happens (the composing statement's, whose parameters are the statement's own)."""

    owner: str  # the module that owns the tables, for messages
    template: str  # the body of the common table expression, without ``name AS (...)``
    params: frozenset[str]

    def __post_init__(self) -> None:
        problem = _mismatch(f"fragment of {self.owner}", self.params, binds_of(self.template.replace("{when}", "true")))
        if problem:
            raise ParamsMismatch(problem)

    @classmethod
    def of(cls, owner: str, template: str, params: Iterable[str]) -> Fragment:
        return cls(owner, template, frozenset(params))

    def cte(self, name: str, *, when: str = "true", materialized: bool = False) -> Cte:
        """The fragment as the common table expression ``name``, written only ``when`` the condition holds."""
        body = self.template.replace("{when}", when)
        return Cte(f"{name} AS {'MATERIALIZED ' if materialized else ''}({body})", self.params, self.owner)

    def relation(self) -> Cte:
        """The fragment as a sub-query, for a FROM or a JOIN."""
        return Cte(f"({self.template})", self.params, self.owner)

    def standalone(self, name: str) -> Statement:
        """The fragment as a statement of its own (its write with no condition), registered as ``name``."""
        return compose(name, self.template.replace("{when}", "true"), own=self.params)


@dataclass(frozen=True)
class Statement:
    """A composed statement and exactly the parameters it requires."""

    name: str
    clause: TextClause
    params: frozenset[str]

    def check(self, given: Mapping[str, Any]) -> None:
        problem = _mismatch(f"statement {self.name}", self.params, given.keys(), given=True)
        if problem:
            raise ParamsMismatch(problem)

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> CursorResult[Any]:
        self.check(params)
        return conn.execute(self.clause, dict(params))

    def rows(self, conn: Connection, params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """A hot statement's rows, as mappings, on the connection's driver (``core.db.hot_rows``)."""
        self.check(params)
        return db.hot_rows(conn, self.clause, params)


COMPOSED: dict[str, Statement] = {}


def compose(name: str, template: str, *, own: Iterable[str] = (), compact: bool = False, **ctes: Cte) -> Statement:
    """The statement ``template`` with each ``{slot}`` replaced by the fragment given for it, checked now: its
    SQL binds exactly the fragments' parameters and ``own``. Registered in ``COMPOSED`` as ``name``."""
    slots = set(_SLOT.findall(template))
    if slots != set(ctes):
        raise ParamsMismatch(f"statement {name}: slots {sorted(slots)} but fragments for {sorted(ctes)}")
    sql = template
    for slot, cte in ctes.items():
        sql = sql.replace("{" + slot + "}", cte.sql)
    if compact:  # on one line: a hot statement stays under psycopg's cached length (core.db.compact_sql)
        sql = " ".join(sql.split())
    required = frozenset(own).union(*(cte.params for cte in ctes.values()))
    problem = _mismatch(f"statement {name}", required, binds_of(sql))
    if problem:
        raise ParamsMismatch(problem)
    if name in COMPOSED and COMPOSED[name].clause.text != sql:
        raise ParamsMismatch(f"two statements are named {name}")
    statement = Statement(name, text(sql), required)
    COMPOSED[name] = statement
    return statement
