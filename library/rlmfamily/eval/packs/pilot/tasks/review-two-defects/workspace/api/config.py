DATABASE_URL = "postgresql://reports:Winter2026!@db.internal:5432/reports"
PAGE_SIZE = 50
