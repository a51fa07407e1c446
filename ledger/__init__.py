"""The credit ledger: customers, keys, grants, entitlements, reservations, settlements, the journal."""
