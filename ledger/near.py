"""Near matches of a customer or key id the service does not know: the "did you mean" of an operator's typo.

Bounded reads, each an index range of the table's primary key: ``NEIGHBOURS`` ids each side of the typo in id
order, and as many from the typo's first ``PREFIX_CHARS`` characters on (so a typo near the start still meets
its id's neighbours). Of those, ``difflib``'s close matches, best first, at most ``MAX_SUGGESTIONS``. A service
with millions of ids may miss a near match; it never reads more than ``3 * NEIGHBOURS`` rows.
"""

from __future__ import annotations

import difflib

from sqlalchemy import Connection, text

MAX_SUGGESTIONS = 3
NEIGHBOURS = 50
PREFIX_CHARS = 2
MIN_SIMILARITY = 0.6  # difflib's ratio: "acme-corp" for "acme-crop" is 0.89, "zeta" for "acme" 0.25


def _near_sql(table: str, column: str) -> str:
    return (f"(SELECT {column} FROM {table} WHERE {column} < :typo ORDER BY {column} DESC LIMIT :n) UNION "
            f"(SELECT {column} FROM {table} WHERE {column} >= :typo ORDER BY {column} LIMIT :n) UNION "
            f"(SELECT {column} FROM {table} WHERE {column} >= :prefix ORDER BY {column} LIMIT :n)")


_NEAR_CUSTOMERS = text(_near_sql("customers", "customer_id"))
_NEAR_KEYS = text(_near_sql("api_keys", "key_id"))


def _best(typo: str, candidates: list[str]) -> list[str]:
    return difflib.get_close_matches(typo, [c for c in candidates if c != typo], n=MAX_SUGGESTIONS,
                                     cutoff=MIN_SIMILARITY)


def near_customer_ids(conn: Connection, typo: str) -> list[str]:
    found = conn.execute(_NEAR_CUSTOMERS, {"typo": typo, "prefix": typo[:PREFIX_CHARS], "n": NEIGHBOURS}).scalars()
    return _best(typo, list(found))


def near_key_ids(conn: Connection, typo: str) -> list[str]:
    # Every key id starts "key_": the prefix range starts after it.
    prefix = typo[:len("key_") + PREFIX_CHARS]
    found = conn.execute(_NEAR_KEYS, {"typo": typo, "prefix": prefix, "n": NEIGHBOURS}).scalars()
    return _best(typo, list(found))


def did_you_mean(suggestions: list[str]) -> str:
    """The sentence appended to a not-found message, or nothing."""
    if not suggestions:
        return ""
    return "; did you mean " + " or ".join(repr(s) for s in suggestions) + "?"
