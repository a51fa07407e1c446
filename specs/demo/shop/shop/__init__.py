"""A tiny shop: customers and orders in SQLite."""
