import sqlite3


def orders_of(conn: sqlite3.Connection, customer_id: int, limit: int = 20):
    """A customer's newest orders, parameterised."""
    return conn.execute(
        "SELECT id, total FROM orders WHERE customer_id = ? ORDER BY id DESC LIMIT ?",
        (customer_id, limit),
    ).fetchall()
