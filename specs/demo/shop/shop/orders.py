"""Orders: place and list, always with query parameters."""

from shop.db import connect


def place(customer_id: int, item: str, quantity: int) -> int:
    conn = connect()
    cursor = conn.execute(
        "INSERT INTO orders (customer_id, item, quantity) VALUES (?, ?, ?)", (customer_id, item, quantity)
    )
    conn.commit()
    return cursor.lastrowid


def for_customer(customer_id: int):
    conn = connect()
    return conn.execute("SELECT * FROM orders WHERE customer_id = ?", (customer_id,)).fetchall()
