"""The A2A edge: Agent Cards, keys, admission with reservation, the PostgreSQL task store, the wire.

The official a2a-sdk owns the wire protocol (JSON-RPC and HTTP+JSON route
builders, the request handler, the cluster task store and event stream); this
package adds what the SDK leaves to the service: authentication, tenancy,
admission (limits, idempotency, credits), rate limits, the dispatch outbox,
cancel, and observability. Specialists run on workers (``workers/``), never in
the edge. ``app.assembly.create_app`` assembles it.
"""
