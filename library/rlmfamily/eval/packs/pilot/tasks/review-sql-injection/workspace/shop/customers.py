import sqlite3


def connect(path):
    return sqlite3.connect(path)


def find_customer(conn, email):
    """The customer row with this e-mail address, or None."""
    return conn.execute(f"SELECT id, name FROM customers WHERE email = '{email}'").fetchone()


def list_customers(conn, limit=50):
    return conn.execute("SELECT id, name FROM customers ORDER BY id LIMIT ?", (limit,)).fetchall()
