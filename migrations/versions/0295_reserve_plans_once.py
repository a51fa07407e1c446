"""``ledger_reserve`` holds its lots one statement a lot, so PostgreSQL plans the statement once per session.

Every paid admission reserves (``ledger_reserve``, inside the admission's statement). Its lots were held in one
``UPDATE ledger_lots ... FROM unnest(v_lots, v_takes)``; PL/pgSQL keeps a generic plan of each statement only when
it costs no more than the plans made for the values at hand, and the generic plan of that join (ten rows guessed
for an array it cannot see) never did: the statement was planned again at every reservation (seen in a debugger:
13 plans in 12 calls; every other statement of the function 6), 5.8% of the database's CPU in a profile of
``bench/admission.py`` (perf, the edge's backends; issue 44). Each lot is now held by its own
``UPDATE ... WHERE lot_id = v_lots[i]``, whose generic plan is the plan for any value (the primary key), kept from
the sixth call of a session on. A reservation takes one lot, or a few, so it runs one statement, or a few. The
admission's statement, 2,000 in a row on one connection, alternating: 0.98, 0.85, 0.86 -> 0.81, 0.74, 0.78 ms of
the backend's CPU each.

Nothing else changes: the same lots in the same order, the same amounts, the same journal rows and result; the
function is ``0002_ledger``'s text with that one statement replaced (checked below), and the downgrade puts that
text back. Expand-only: the function's signature and results are the same for the code before this revision.

Revision ID: 0295
Revises: 0294
"""

import importlib.util
from pathlib import Path

from alembic import op

from migrations.compat import forget, record

revision = "0295"
down_revision = "0294"
branch_labels = None
depends_on = None



def _ledger_migration():
    """Migration 0002's module, read from its file (alembic loads migrations by path, not as a package)."""
    spec = importlib.util.spec_from_file_location("ledger_migration_0002", Path(__file__).with_name("0002_ledger.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


_LEDGER = _ledger_migration()
# ``RESERVE_FN`` creates ledger_reserve, then ledger_reserve_replay (unchanged here).
_RESERVE = _LEDGER.RESERVE_FN[: _LEDGER.RESERVE_FN.index("CREATE FUNCTION ledger_reserve_replay")]
_CREATE, _REPLACE = "CREATE FUNCTION ledger_reserve(", "CREATE OR REPLACE FUNCTION ledger_reserve("
_HOLD_ALL = """
    UPDATE ledger_lots l SET held = l.held + t.take
      FROM unnest(v_lots, v_takes) AS t(lot_id, take)
     WHERE l.lot_id = t.lot_id;
"""
_HOLD_EACH = """
    FOR i IN 1 .. cardinality(v_lots) LOOP
        UPDATE ledger_lots SET held = held + v_takes[i] WHERE lot_id = v_lots[i];
    END LOOP;
"""
assert _RESERVE.count(_CREATE) == 1 and _RESERVE.count(_HOLD_ALL) == 1, "0002's ledger_reserve is not as expected"
BEFORE = _RESERVE.replace(_CREATE, _REPLACE)
AFTER = BEFORE.replace(_HOLD_ALL, _HOLD_EACH)


def upgrade() -> None:
    op.execute(AFTER)
    record(revision, down_revision, serves_previous_code=True,
           note="expand only: ledger_reserve holds each lot in a statement of its own, same results")


def downgrade() -> None:
    op.execute(BEFORE)
    forget(revision)
