"""A2A delegation: opt-in delegation of bounded work to explicitly configured A2A 1.0 peers.

Modules: ``peers`` (the peers file), ``client`` (the strict HTTP client),
``wire`` (A2A 1.0 ProtoJSON with the a2a-sdk's types, carried on JSON-RPC or HTTP+JSON), ``store`` (durable
delegations and the family's credit allowance), ``delegations`` (admission,
send, handles, reconcile), ``namespace`` (the ``a2a`` name in the sandbox),
``cli`` (``rlm peers``, ``rlm delegations``, ``rlm reconcile``).
Off by default: see docs/RLM.md, "Delegating to A2A peers".
"""
