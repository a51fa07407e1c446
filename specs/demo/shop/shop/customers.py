"""Customers: look up and list."""

from shop.db import connect


def find_by_email(email: str):
    conn = connect()
    return conn.execute(f"SELECT id, name FROM customers WHERE email = '{email}'").fetchone()


def list_customers(limit: int = 50):
    conn = connect()
    return conn.execute("SELECT id, name FROM customers ORDER BY id LIMIT ?", (limit,)).fetchall()
