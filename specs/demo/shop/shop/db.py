"""The database connection."""

import sqlite3


def connect(path: str = "shop.sqlite3") -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    return conn
