"""Settings and the database layer shared by the service rooms (ledger, app, workers)."""
