"""The A2A edge: Agent Cards, authentication, admission with reservation, the wire, for every specialist.

The official a2a-sdk owns the wire protocol (the JSON-RPC and HTTP+JSON route
builders, the request handler, the cluster task store and its event stream);
this package adds what the SDK leaves to the service: the gRPC binding on the
same handlers (``grpc_binding``), authentication and tenancy (``middleware``,
``identity``), the bounds of a request body checked before anything parses it
(``bodies``), admission (limits, idempotency, credits) in one statement
(``admission``), rate limits and stream slots, the listing, push configurations,
the one vocabulary of refusals and their wire forms (``errors``) with the
outermost guard that keeps every answer in it (``boundary``), and observability.
The task state it shares with the workers (task rows, the outbox, claims, the
customer's cancel) is ``taskstate``'s; specialists run on workers (``workers/``),
never in the edge.
``app.assembly.create_app`` assembles it, ``app.server`` serves it.
"""
