"""The operator console (issue 20): a server-rendered web surface over the ledger's and the service's own reads
and operations, for operators only (``auth``). `specialists console` serves it; `specialists serve` starts it."""
